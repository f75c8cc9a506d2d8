"""Generated gRPC code for the freeride.v1 API (see proto/). Do not edit."""
