"""The names a client's calls carry besides IFRT's own, for both ends.

An IfrtSession's metadata travels in SESSION_METADATA (JAX's client sets
it); jax_pathways' client adds the *_KEY attributes to its initialization
data; calls outside a session (the admin service, a client's callbacks
stream) carry the token in TOKEN_HEADER. The controller's own admin
service (jax_pathways.admin, `jax-pathways status`) serves the ADMIN_*
methods.
"""
SESSION_METADATA = "ifrt-proxy-grpc-ifrt-session-metadata-bin"
TOKEN_KEY = "jax_pathways_token"
# The virtual slice a client asks for (initialize(devices=..., island=...)).
DEVICES_KEY = "jax_pathways_devices"
ISLAND_KEY = "jax_pathways_island"
WEIGHT_KEY = "jax_pathways_weight"  # its share of saturated islands
# The id under which the client serves its programs' callbacks.
CALLBACKS_KEY = "jax_pathways_callbacks"
# The packages the client runs, which its colocated processes must run too
# (colocated/packages.py).
PACKAGES_KEY = "jax_pathways_packages"
TOKEN_HEADER = "jax-pathways-token"
# A client's callbacks stream: its method, and the header naming the client
# (CALLBACKS_KEY's value).
CALLBACKS_METHOD = "/jax_pathways.Callbacks/Serve"
CALLBACKS_HEADER = "jax-pathways-callbacks"
# The admin service: status, traces, slice checks, supervisors' reports;
# Ping answers liveness only (no token; client/controller_watch.py).
ADMIN_SERVICE = "/jax_pathways.Admin/"
ADMIN_STATUS = ADMIN_SERVICE + "Status"
ADMIN_TRACE = ADMIN_SERVICE + "Trace"
ADMIN_CHECK_SLICE = ADMIN_SERVICE + "CheckSlice"
ADMIN_SUPERVISION = ADMIN_SERVICE + "Supervision"
ADMIN_PING = ADMIN_SERVICE + "Ping"
ADMIN_CANCEL = ADMIN_SERVICE + "Cancel"
