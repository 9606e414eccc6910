/* Every compression method this build has. A method named NAME lives in
 * lib/methods/NAME.c (the mosaic family in lib/mosaic/) and defines
 * `const mkv_method mkv_method_NAME`; registering it is one more X(NAME) line below. The order is the order of
 * --list-methods and of the test sweeps. */
#include "config.h"
#include "methods/method.h"

#define MKV_METHOD_LIST(X) \
    X(full)                \
    X(mosaic)              \
    X(uniform2d)           \
    X(quest)               \
    X(think)               \
    X(kivi)                \
    X(snapkv)              \
    X(streaming)           \
    X(naive2d)             \
    X(turboquant)          \
    X(cam)                 \
    /* end of the list */

#define DECLARE(name) extern const mkv_method mkv_method_##name;
MKV_METHOD_LIST(DECLARE)

#define ENTRY(name) &mkv_method_##name,
const mkv_method *const mkv_methods[] = {MKV_METHOD_LIST(ENTRY) NULL};
