"""ggufdspark: DSpark speculative-decoding drafters for llama.cpp.

Convert the safetensors drafter (and its LFM2 / LFM2-VL target) to GGUF, check that a
target/draft pair belongs together, serve it with ``llama-server --spec-type draft-dspark``,
read the acceptance timings, benchmark, tune and publish.
"""

__version__ = "0.1.0"
