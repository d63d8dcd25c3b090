"""What every API's adapter uses: the one request builder, the shared fields and their checks, the
output constraints, several completions, logprobs, timings and progress in llama-server's shapes."""
