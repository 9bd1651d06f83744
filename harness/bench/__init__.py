"""pdconform bench: matrix, simulator and engine figures against the project's goals."""
