# syntax=docker/dockerfile:1
# One build, one image per deployable (the Kubernetes manifests in k8s/ name them):
#   docker build --target api        -t reminders-api:0.1.0 .
#   docker build --target dispatcher -t reminders-dispatcher:0.1.0 .
#   docker build --target notifier   -t reminders-notifier:0.1.0 .
#   docker build --target migrate    -t reminders-migrate:0.1.0 .
# Each runs the `reminders` console script as a numeric non-root user; the root file
# system may be mounted read-only (nothing is written outside /tmp).

FROM python:3.11.14-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md constraints.txt build-constraints.txt ./
COPY cql/ cql/
COPY genproto/ genproto/
COPY reminders_svc/ reminders_svc/
COPY dispatcher/ dispatcher/
COPY notifier/ notifier/
COPY devnode/ devnode/
RUN python -m venv /opt/reminders \
    && /opt/reminders/bin/pip install -c constraints.txt --upgrade pip \
    && /opt/reminders/bin/pip install -c constraints.txt --build-constraint build-constraints.txt . \
    && /opt/reminders/bin/python -m compileall -q /opt/reminders

FROM python:3.11.14-slim-bookworm AS runtime
COPY --from=build /opt/reminders /opt/reminders
ENV PATH=/opt/reminders/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
ENTRYPOINT ["reminders"]
CMD ["--help"]

FROM runtime AS api
EXPOSE 50051 9464
CMD ["serve-api"]

FROM runtime AS dispatcher
EXPOSE 50071 9466
CMD ["dispatch"]

FROM runtime AS notifier
EXPOSE 50061 9465
CMD ["notifier"]

FROM runtime AS migrate
CMD ["migrate"]
