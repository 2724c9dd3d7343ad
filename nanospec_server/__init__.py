"""nanospec-server: SGLang speculative decoding with a dynamic draft vocabulary (NanoSpec)."""
