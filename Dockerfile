# Dockerfile -- the streamwire images: the CLI (worker, gateway, generate,
# instances, demo) on Debian bookworm (target runtime), and the Python
# worker (python/examples/worker.py over libstreamwire.so; target python),
# built from this tree by its own CMake build. Only Debian packages.
# docker-compose.yml runs the cluster.

# ---------------------------------------------------------------- build
FROM debian:bookworm-slim AS build
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      build-essential cmake pkg-config libnats-dev libprotobuf-c-dev protobuf-c-compiler \
      libsodium-dev libcmocka-dev libh2o-evloop-dev libjansson-dev libssl-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSW_BUILD_TESTS=OFF -DSW_BUILD_BENCH=OFF >/dev/null \
    && cmake --build /build -j"$(nproc)" --target streamwire_cli streamwire \
    && install -m 0755 /build/streamwire /usr/local/bin/streamwire \
    && cp -P /build/libstreamwire.so* /usr/local/lib/

# ---------------------------------------------------------------- nats
# A NATS server from Debian's package, for the cluster (no image registry is
# needed): docker-compose.yml builds this target for its three nodes.
FROM debian:bookworm-slim AS nats
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends nats-server curl \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data && chown nats /data
# (Debian's nats-server package made the system user "nats")
USER nats
ENTRYPOINT ["nats-server"]

# ---------------------------------------------------------------- runtime
FROM debian:bookworm-slim AS runtime
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      libnats3.4 libprotobuf-c1 libsodium23 libh2o-evloop0.13 libjansson4 curl ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home /nonexistent --shell /usr/sbin/nologin streamwire
COPY --from=build /usr/local/bin/streamwire /usr/local/bin/streamwire
USER streamwire
ENTRYPOINT ["/usr/local/bin/streamwire"]
CMD ["--help"]

# ---------------------------------------------------------------- python
# The Python worker: the runtime's libraries, python3 from Debian, the
# shared library and the `streamwire` package (ctypes; nothing from an index).
FROM runtime AS python
USER root
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/lib/libstreamwire.so* /usr/local/lib/
RUN ldconfig
COPY python/streamwire /opt/streamwire/python/streamwire
COPY python/examples/worker.py /opt/streamwire/python/examples/worker.py
ENV PYTHONPATH=/opt/streamwire/python STREAMWIRE_LIB=/usr/local/lib/libstreamwire.so
USER streamwire
ENTRYPOINT ["python3", "/opt/streamwire/python/examples/worker.py"]
CMD ["--help"]
