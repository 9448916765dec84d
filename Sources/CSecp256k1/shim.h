#ifndef THALI_CSECP256K1_SHIM_H
#define THALI_CSECP256K1_SHIM_H
#include <secp256k1.h>
#include <secp256k1_ecdh.h>
#include <secp256k1_preallocated.h>
#endif
