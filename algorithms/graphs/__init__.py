"""Graph maths: whom a node collaborates with (MAPL's CGL, SCooL's E-step and priors), the
simplex projection, the scores peers exchange, and the graph metrics of a report."""
