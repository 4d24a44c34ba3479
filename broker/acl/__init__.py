"""RocketMQ 4.x plain ACL for the broker: plain_acl.yml, request signatures, the guard."""
