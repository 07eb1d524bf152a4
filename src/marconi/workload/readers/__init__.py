"""One module per trace format; each exposes `read(source, options) -> Built`."""
