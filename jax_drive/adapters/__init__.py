"""Optional adapters to other simulators and datasets (imported lazily)."""
