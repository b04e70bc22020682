# The DeepSpeed release whose Python API, config keys and checkpoint layout this package
# follows (shared/reference/deepspeed_compat.md). Read by setup.py for the version.
DEEPSPEED_API_VERSION = "0.19.8"
