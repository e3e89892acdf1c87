"""The demo: several engine processes publishing real declarations, served by the sidecar."""
