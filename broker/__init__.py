"""The broker: store, processors, HA."""
