#ifndef THALI_COPENSSL_SHIM_H
#define THALI_COPENSSL_SHIM_H
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/dh.h>
#include <openssl/core_names.h>
#include <openssl/sha.h>

// OpenSSL exposes some of its API as macros, which Swift cannot call; these wrappers give them names.

static inline long thali_SSL_CTX_set_min_proto_version(SSL_CTX *ctx, int version) {
    return SSL_CTX_set_min_proto_version(ctx, version);
}

static inline long thali_SSL_CTX_set_max_proto_version(SSL_CTX *ctx, int version) {
    return SSL_CTX_set_max_proto_version(ctx, version);
}

static inline int thali_SSL_get_ex_new_index(void) {
    return SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
}

static inline long thali_SSL_CTX_set_session_cache_mode(SSL_CTX *ctx, long mode) {
    return SSL_CTX_set_session_cache_mode(ctx, mode);
}

static inline long thali_SSL_CTX_set_mode(SSL_CTX *ctx, long mode) {
    return SSL_CTX_set_mode(ctx, mode);
}

/// The key the peer used in the key exchange (a new reference: the caller frees it), or NULL.
static inline EVP_PKEY *thali_SSL_get_peer_tmp_key(SSL *ssl) {
    EVP_PKEY *key = NULL;
    if (SSL_get_peer_tmp_key(ssl, &key) != 1) return NULL;
    return key;
}

/// The key this side used in the key exchange (a new reference: the caller frees it), or NULL.
static inline EVP_PKEY *thali_SSL_get_tmp_key(SSL *ssl) {
    EVP_PKEY *key = NULL;
    if (SSL_get_tmp_key(ssl, &key) != 1) return NULL;
    return key;
}

static inline void thali_BIO_set_retry_read(BIO *bio) {
    BIO_set_retry_read(bio);
}

static inline void thali_BIO_clear_retry_flags(BIO *bio) {
    BIO_clear_retry_flags(bio);
}

/// Options that Swift cannot import (they are built with the SSL_OP_BIT macro).
static inline uint64_t thali_SSL_OP_NO_TICKET(void) { return SSL_OP_NO_TICKET; }
static inline uint64_t thali_SSL_OP_NO_RENEGOTIATION(void) { return SSL_OP_NO_RENEGOTIATION; }
static inline uint64_t thali_SSL_OP_NO_COMPRESSION(void) { return SSL_OP_NO_COMPRESSION; }

/// SHA-256 one block at a time on a caller-owned context (a plain struct, no allocation). OpenSSL 3
/// deprecates these for EVP, whose per-digest context and provider dispatch cost more than the two
/// compressions of a short HMAC; ThaliBeacons keys an HMAC once and copies its states (`HMACSHA256`).
/// The wrappers keep the deprecation inside this system header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static inline void thali_SHA256_Init(SHA256_CTX *context) { SHA256_Init(context); }
static inline void thali_SHA256_Update(SHA256_CTX *context, const void *bytes, size_t count) {
    SHA256_Update(context, bytes, count);
}
static inline void thali_SHA256_Final(unsigned char *digest, SHA256_CTX *context) { SHA256_Final(digest, context); }
#pragma GCC diagnostic pop

#endif
