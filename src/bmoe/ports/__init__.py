"""Ports: the interfaces the service layer needs, implemented by adapters and fakes."""
