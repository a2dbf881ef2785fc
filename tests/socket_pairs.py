"""Connected socket pairs for driving the C++ transport over TCP."""
import socket


def tcp_pair() -> tuple[socket.socket, socket.socket]:
  """Two ends of one loopback TCP connection."""
  server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  server.bind(("127.0.0.1", 0))
  server.listen(1)
  client = socket.create_connection(server.getsockname())
  accepted, _ = server.accept()
  server.close()
  return client, accepted
