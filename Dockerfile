# The image of a Kubernetes cluster (docs/deploy.md): jax_pathways built
# from this checkout, `jax-pathways` on PATH, run as a user without root.
#
#   docker build -t REGISTRY/jax-pathways:TAG . && docker push REGISTRY/jax-pathways:TAG
#
# Debian bookworm, as in CI: its grpc++ (1.51) is what the controller's
# frontend is built against and loads.
FROM python:3.11-slim-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ pkg-config libgrpc++-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
# The run-time library of grpc++ (and what it needs), without compilers.
RUN apt-get update \
 && apt-get install -y --no-install-recommends 'libgrpc++1.51' \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
RUN useradd --uid 1000 --create-home jax
USER 1000
