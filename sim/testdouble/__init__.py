"""TEST DOUBLE engine code (stdlib only) shipped in the ``sglang-sim:test-double`` image (also
tagged ``vllm-sim:test-double``).

Nothing here is SGLang or vLLM: it only accepts the launcher flags the program uses, forms a rank
group over TCP (SGLang) or checks the REAL Ray cluster's alive nodes and GPUs (vLLM; Ray itself is the
PyPI wheel installed in the image, see ``sim.rootfs.RAY_WHEELS``), serves a fake OpenAI-compatible API
and packs a fake engram table. Modules: ``flags`` (every flag table), ``openai_api`` (shared HTTP),
``server``/``launch_server`` (SGLang), ``vllm_serve`` (``vllm serve``), ``engram``, ``nccl`` (NCCL 2.30's
init rules on the node's interfaces and RoCE sysfs, run by both doubles once their group formed). The package is
importable on the host (as ``sim.testdouble``) for unit tests and is copied into the image as
``dspark_testdouble``; modules use relative imports only.
"""
