"""Runtime: targets, the Kernel object, argument checks, compile and launch."""
