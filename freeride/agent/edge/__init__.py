"""The agent's edge: gRPC servicers, the one place protobuf meets the domain (convert), requests that do
not parse (wire), the TCP token check, checks of bubble edges, trainers' rings, /metrics."""
