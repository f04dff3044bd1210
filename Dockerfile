# The eagle-synth image: producer, worker and Flower in one. No GPU code: the GPU work runs in
# the SGLang container; this image only talks to it over HTTP and to Redis.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # transformers may cache tokenizer files; keep that inside the container's writable /tmp.
    HF_HOME=/tmp/hf

# A fixed, unprivileged user: Celery warns when run as root, and records on a bind-mounted
# output folder are owned by this uid (override with `user:` in docker-compose.yml).
ARG APP_UID=1000
RUN useradd --create-home --uid "${APP_UID}" eagle \
    && mkdir -p /data/out /data/in /data/tokenizer \
    && chown -R eagle /data

WORKDIR /src
# Dependencies first, so code edits do not re-download them: install the project's
# requirements from pyproject.toml alone, then the project itself.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml','rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt
COPY . .
RUN pip install --no-deps . && eagle-synth --help > /dev/null

USER eagle
WORKDIR /data
ENTRYPOINT ["eagle-synth"]
CMD ["--help"]
