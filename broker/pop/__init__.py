"""Pop consumption (RocketMQ 5 ``PopMessageProcessor`` and friends): see ``broker/pop/service.py``."""
