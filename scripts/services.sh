#!/usr/bin/env bash
# Start the local servers the test suite talks to, when they are not already up.
# Everything binds to 127.0.0.1. Idempotent: safe to run before every test run.
set -euo pipefail

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if ! up 5432; then
  echo "services: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
fi
if ! up 6379; then
  echo "services: starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
for _ in $(seq 1 50); do
  if up 5432 && up 6379; then echo "services: PostgreSQL and Redis are up"; exit 0; fi
  sleep 0.2
done
echo "services: PostgreSQL or Redis did not come up on 127.0.0.1" >&2
exit 1
