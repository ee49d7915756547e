"""The emulated DP cluster: one process per DP rank running a stub vLLM engine loop
around the real DyntraLB code."""
