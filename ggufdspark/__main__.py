from ggufdspark.cli import main

main()
