/*
 * store_internal.h - every layer's header, included bottom-up (as SQLite's
 * sqliteInt.h includes its modules' headers).  A transition: each file
 * moves to its own layer's header, and this one goes.
 */
#ifndef EMBKV_STORE_INTERNAL_H
#define EMBKV_STORE_INTERNAL_H

#include "base.h"
#include "format.h"
#include "handle.h"
#include "persist.h"
#include "log.h"
#include "index.h"
#include "heat.h"
#include "tiers.h"
#include "ops.h"
#include "top.h"

#endif
