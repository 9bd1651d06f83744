"""Inside a role process: the adapter contract, the recorder, fault points and engine faults, the byte pattern and pools."""
