"""The measuring wing: ``bench`` (and ``bench --load``, ``bench --sampling-check``), ``tune`` (and
``tune --load``), the arm machinery they share (``measure``), the lossless gate, their reports, the
prompt sets and the tune profiles ``serve`` reads (``profiles``). ``docs/layout.md`` says which module
does what. Nothing is imported here: reading one module costs no other."""
