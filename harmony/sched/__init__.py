"""Harmony's scheduling core (dissertation §4.3.2), pure: profiles in,
decisions out. No sockets, processes, files or clocks."""
