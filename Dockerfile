# Deskmate: `docker compose up -d` runs this image next to PostgreSQL + pgvector (docker-compose.yml).
# Alone (`docker run --env-file .env -v deskmate-data:/data deskmate`) it uses the embedded PostgreSQL under /data.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DATA_DIR=/data

WORKDIR /app
COPY requirements.txt ./
RUN pip install -r requirements.txt

COPY bot ./bot
COPY cogs ./cogs
COPY migrations ./migrations

# PostgreSQL (embedded mode) refuses to run as root, and a bot has no reason to either.
# /app/data too, for an old .env that still says DATA_DIR=./data (the bot then warns that it is not on a volume).
RUN useradd --create-home --uid 10001 deskmate && mkdir -p /data /app/data && chown deskmate:deskmate /data /app/data
USER deskmate
VOLUME ["/data"]

# The bot touches DATA_DIR/heartbeat every 30 s while it is connected to Discord (DATA_DIR as the bot reads it).
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, pathlib, sys, time; p = pathlib.Path(os.environ.get('DATA_DIR') or 'data', 'heartbeat'); sys.exit(0 if p.exists() and time.time() - p.stat().st_mtime < 120 else 1)"]

# SIGTERM (docker stop) closes the gateway, the database pool and the embedded server cleanly, at any moment,
# start-up included (the bot is PID 1 here: it handles SIGTERM from its first line, see bot/shutdown.py).
STOPSIGNAL SIGTERM
CMD ["python", "-m", "bot", "run"]
