# nanospec-server on NVIDIA GPUs: SGLang's own CUDA image (full SGLang 0.5.23, kernels
# included) plus this package, run as a non-root user.
#
#   docker build -t nanospec-server .
#   docker run --gpus all -p 127.0.0.1:30000:30000 -v nanospec-models:/models \
#       -e NANOSPEC_ADMIN_KEY=change-me nanospec-server
#
# Models live in the /models volume ($NANOSPEC_CACHE): the default model is prepared there
# on the first start; pass `--model-path /models/...` (and SGLang's speculative flags) to
# serve your own. Settings come from the environment below; any further `nanospec serve`
# or SGLang flag can be appended to `docker run ... nanospec-server`.
ARG BASE_IMAGE=lmsysorg/sglang:v0.5.23-cu130
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    NANOSPEC_CACHE=/models \
    NANOSPEC_PORT=30000 \
    NANOSPEC_MODE=nanospec \
    NANOSPEC_W_MAX=3072 \
    NANOSPEC_K_PRE=3 \
    NANOSPEC_K_VER=3
# The admin key: NANOSPEC_ADMIN_KEY, or a file such as a compose secret in
# NANOSPEC_ADMIN_KEY_FILE. Without one, live settings changes are refused (403).

WORKDIR /opt/nanospec-server
COPY pyproject.toml README.md ./
COPY nanospec_server ./nanospec_server
# SGLang and its CUDA stack come with the base image; pip adds only what is missing.
RUN python3 -m pip install --no-cache-dir . \
    && python3 -c "import sglang, nanospec_server; assert sglang.__version__ == '0.5.23', sglang.__version__"

RUN useradd --create-home --uid 1000 nanospec \
    && mkdir -p /models && chown nanospec:nanospec /models
USER nanospec
VOLUME ["/models"]
EXPOSE 30000

# /health answers without a key (SGLang's auth lets probes through).
HEALTHCHECK --interval=30s --timeout=10s --start-period=600s --retries=3 \
    CMD python3 -c "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\"NANOSPEC_PORT\"]}/health', timeout=8)"

# Inside the container the server must listen on every interface; publish the port on
# 127.0.0.1 (as above and in deploy/compose.yaml) unless it should be reachable from outside.
ENTRYPOINT ["/bin/sh", "-c", "exec nanospec serve --host 0.0.0.0 --port \"$NANOSPEC_PORT\" --nanospec-mode \"$NANOSPEC_MODE\" --nanospec-w-max \"$NANOSPEC_W_MAX\" --nanospec-k-pre \"$NANOSPEC_K_PRE\" --nanospec-k-ver \"$NANOSPEC_K_VER\" \"$@\"", "nanospec"]
CMD []
