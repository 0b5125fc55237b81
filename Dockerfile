# The dispatcher's image: `docker compose up` builds it (compose.yaml); `docker build -t
# delay-dispatcher .` alone works too. Two stages: the wheels are built from the repository (the
# SDK first: the service pins it and no index has it), and only they reach the runtime image.
# Both stages install the versions constraints.txt pins, the ones the suite ran on.
FROM python:3.11-slim AS wheels
WORKDIR /src
COPY constraints.txt ./
RUN pip install --no-cache-dir -c constraints.txt "build>=1.2"
COPY LICENSE README.md CHANGELOG.md pyproject.toml ./
COPY sdk/ sdk/
COPY consumers_sdk/ consumers_sdk/
COPY dispatcher/ dispatcher/
COPY sql/ sql/
RUN python -m build --wheel -o /wheels sdk && python -m build --wheel -o /wheels .

FROM python:3.11-slim
# Not root: the node needs no privilege, only its port.
RUN useradd --system --uid 10001 --no-create-home dispatcher
COPY --from=wheels /wheels /tmp/wheels
COPY constraints.txt /tmp/constraints.txt
RUN pip install --no-cache-dir -c /tmp/constraints.txt /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels /tmp/constraints.txt
USER dispatcher
ENV DISPATCHER_HTTP_HOST=0.0.0.0 \
    DISPATCHER_HTTP_PORT=8080 \
    PYTHONUNBUFFERED=1
EXPOSE 8080
# /healthz answers while the process serves; /readyz (firing, broker, database) is for balancers.
HEALTHCHECK --interval=5s --timeout=3s --retries=12 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
# `serve` applies the migrations first; `docker compose run dispatcher keys create ...` runs the CLI.
ENTRYPOINT ["dispatcher"]
CMD ["serve"]
