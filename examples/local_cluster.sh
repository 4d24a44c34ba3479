#!/usr/bin/env bash
# A local cluster in one terminal, and the CLI against it in another.
#
#   rmq up                                    # namesrv 127.0.0.1:9876, broker-a 10911 (HA 10912, VIP 10909)
#   rmq up --masters 2 --data-dir /tmp/rmq    # broker-a on 10911, broker-b on 10921
#
# Then:
set -euo pipefail
rmq topic create TopicTest --queues 4
rmq produce --topic TopicTest --tags TagA hello world
printf 'line 1\nline 2\n' | rmq produce --topic TopicTest
rmq consume --topic TopicTest --from-beginning --count 4 -v
rmq topic route TopicTest
rmq cluster
