"""SGLang 0.5.23's KV cache events, shared by the emulated worker (which publishes them) and
pdkit's router (which indexes them): the wire format (`wire`), SGLang's block hashes
(`blocks`) and a ZMQ publisher (`publisher`)."""
