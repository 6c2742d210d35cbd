/* SPDX-License-Identifier: BSD-3-Clause */
/* A small generic vector: DEFINE_VECTOR_TYPE (name, type) declares
 * struct-like type `name` with ptr/len/cap and name_append/name_reset.
 */
#ifndef NBDMAPPER_VECTOR_H
#define NBDMAPPER_VECTOR_H

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int generic_vector_reserve (void **ptr, size_t *cap, size_t len,
                            size_t n, size_t itemsize);

#define DEFINE_VECTOR_TYPE(name, type)                                  \
  typedef struct {                                                      \
    type *ptr;                                                          \
    size_t len;                                                         \
    size_t cap;                                                         \
  } name;                                                               \
  static inline int __attribute__ ((__unused__))                        \
  name##_reserve (name *v, size_t n)                                    \
  {                                                                     \
    return generic_vector_reserve ((void **) &v->ptr, &v->cap, v->len,  \
                                   n, sizeof (type));                   \
  }                                                                     \
  static inline int __attribute__ ((__unused__))                        \
  name##_append (name *v, type elem)                                    \
  {                                                                     \
    if (name##_reserve (v, 1) == -1)                                    \
      return -1;                                                        \
    v->ptr[v->len++] = elem;                                            \
    return 0;                                                           \
  }                                                                     \
  static inline void __attribute__ ((__unused__))                       \
  name##_remove (name *v, size_t i)                                     \
  {                                                                     \
    memmove (&v->ptr[i], &v->ptr[i + 1],                                \
             (v->len - i - 1) * sizeof (type));                         \
    v->len--;                                                           \
  }                                                                     \
  static inline void __attribute__ ((__unused__))                       \
  name##_reset (name *v)                                                \
  {                                                                     \
    free (v->ptr);                                                      \
    v->ptr = NULL;                                                      \
    v->len = v->cap = 0;                                                \
  }

#define empty_vector { .ptr = NULL, .len = 0, .cap = 0 }

#endif /* NBDMAPPER_VECTOR_H */
