"""trio-rmq: shared wire types, codecs and remoting used by servers and clients."""
