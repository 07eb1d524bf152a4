"""Tables and plots of simulation results."""
