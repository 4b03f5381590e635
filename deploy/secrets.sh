#!/bin/sh
# Prints a new secrets file for a leafbus deployment: one NAME=value line per password,
# each random (128 bits, hex, after "pw-" so that nats-server reads it as text, never as
# a number). Keep the output where only the servers' user reads it, never in git:
#
#   umask 077; deploy/secrets.sh > /etc/leafbus/secrets.env     # README's runbook
#   umask 077; deploy/secrets.sh > .env                         # docker-compose.yml
#
#   NATS_ROUTE_PASSWORD              the NATS nodes' routes to each other (deploy/nats.conf)
#   NATS_<USER>_PASSWORD             each role of deploy/nats-roles.conf: DISPENSER,
#                                    DISPENSER_SERVICE, CLIENT_A, CLIENT_B, ETL, OPERATOR
#   MYSQL_LEAFBUS_PASSWORD           the dispensers' MySQL user (README "MySQL segments")
#   MYSQL_ROOT_PASSWORD              MySQL's root, for docker-compose.yml's mysql service
#
# cmd/dispenser/production_test.go and compose_test.go run it and check that it names
# every password the configurations read.
set -eu
for name in NATS_ROUTE NATS_DISPENSER NATS_DISPENSER_SERVICE NATS_CLIENT_A NATS_CLIENT_B NATS_ETL NATS_OPERATOR MYSQL_LEAFBUS MYSQL_ROOT; do
	printf '%s_PASSWORD=pw-%s\n' "$name" "$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
done
