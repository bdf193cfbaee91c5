/* ab_prefetch.h - forced into every file of dev/ab-prefetch.sh's libtern
 * build (-include): PF_DIST becomes this variable (dev/ab/ab_prefetch.c). */
extern unsigned long tern_ab_pf_dist;
