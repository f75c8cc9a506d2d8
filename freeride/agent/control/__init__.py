"""The control path: bubbles → windows → grants and revokes → accounting; the predictor, the policy, the
histogram, training time. Pure logic behind injected ports: imports only the domain, and no protobuf."""
