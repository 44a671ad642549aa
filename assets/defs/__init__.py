"""The dg defs folder: one ConfluxFlows component instance (conflux_flows/defs.yaml)."""
