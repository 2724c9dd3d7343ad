"""The draft kinds NanoSpec serves (EAGLE, EAGLE-3, STANDALONE), one module each."""
