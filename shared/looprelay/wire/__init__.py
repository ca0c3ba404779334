"""What crosses the network: the runner API's bodies and its OpenAPI document."""
