"""The daemon's local API on its Unix socket: the wire (protocol), the listener (server), the
ops it answers (handlers), the caps before parsing (guard) and the one client (client)."""
