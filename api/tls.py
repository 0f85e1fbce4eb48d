"""The gRPC server's TLS credentials, from the settings' PEM files (None: plaintext).

    credentials = server_credentials(settings)

With tls_client_ca, mutual TLS: gRPC refuses, during the handshake, any client or agent that
does not present a certificate signed by that CA.
"""

import grpc

from gosched.common.config import Settings
from gosched.common.secret_files import check_key_pair, read_certificates, read_private_key


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials for the gRPC port, or None when no certificate is set. The files are read
    again here (they were checked at load): SecretFileError naming the setting if one went bad."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    check_key_pair(settings.tls_cert, settings.tls_key, "tls_cert", "tls_key")
    chain = read_certificates(settings.tls_cert, "tls_cert")
    key = read_private_key(settings.tls_key, "tls_key")
    client_ca = read_certificates(settings.tls_client_ca, "tls_client_ca") if settings.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )
