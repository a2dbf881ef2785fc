"""The names a client's calls carry besides IFRT's own fields, for both ends.

An IfrtSession's metadata travels in SESSION_METADATA (JAX's client sets
it); jax_pathways' client adds the *_KEY attributes to its initialization
data; calls outside a session (the admin service, a client's callbacks
stream) carry the token in TOKEN_HEADER.
"""
SESSION_METADATA = "ifrt-proxy-grpc-ifrt-session-metadata-bin"
TOKEN_KEY = "jax_pathways_token"
# The virtual slice a client asks for (initialize(devices=..., island=...)).
DEVICES_KEY = "jax_pathways_devices"
ISLAND_KEY = "jax_pathways_island"
WEIGHT_KEY = "jax_pathways_weight"  # its share of saturated islands
# The id under which the client serves its programs' callbacks.
CALLBACKS_KEY = "jax_pathways_callbacks"
TOKEN_HEADER = "jax-pathways-token"
# A client's callbacks stream: its method, and the header naming the client
# (CALLBACKS_KEY's value).
CALLBACKS_METHOD = "/jax_pathways.Callbacks/Serve"
CALLBACKS_HEADER = "jax-pathways-callbacks"
