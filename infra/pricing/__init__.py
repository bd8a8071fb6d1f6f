"""The price table the estimate reads, and the tool that refreshes it from AWS."""
