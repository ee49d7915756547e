"""DyntraLB: data-parallel load balancing for the decode side of a P/D-disaggregated
deployment. Engine-agnostic; see ``docs`` in the README for the module map."""
