"""TEST DOUBLE engine code (stdlib only) shipped in the ``sglang-sim:test-double`` image.

Nothing here is SGLang: it only accepts the launcher flags the program uses, forms a rank group
over TCP, serves a fake OpenAI-compatible API and packs a fake engram table. The package is
importable on the host (as ``sim.testdouble``) for unit tests and is copied into the image as
``dspark_testdouble``; modules use relative imports only.
"""
