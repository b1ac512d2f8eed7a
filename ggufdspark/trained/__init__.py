"""A small LFM2 target trained on real text and its DSpark drafter trained against it.

Every acceptance figure a random pair gives is an accident of its weights; this pair predicts.
``corpus`` makes the text and tokenizer (the Python standard library's own sources, on any machine),
``nets`` holds the torch drafter (the engine's draft graph written in torch: the training model and
the reference its GGUF is checked against), ``recipe`` trains both and writes them in the published
Hub layout, and ``shipped`` copies the pair that comes with the package (``generate --trained``).
"""
