/* session_path.c - session ids and the file each names inside the
 * sessions folder (srv.h). An id is [A-Za-z0-9_-]{1,64}, so it can never
 * hold "/" or "..", and the file is "<dir>/<id>.tsess". Before the
 * scheduler opens it, the path is checked the way an attacker who can put
 * files into the folder would try to bend it: an existing entry must be a
 * plain regular file (not a symlink, a folder, a FIFO or a device), with
 * one link only (a hard link could point at a file outside the folder), and
 * its resolved path must lie directly inside the resolved folder. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "srv.h"

int srv_session_id_valid(const char *id) {
    if (!id) return 0;
    size_t n = 0;
    for (; id[n]; n++) {
        if (n >= SRV_SESSION_ID_MAX) return 0;
        unsigned char c = (unsigned char)id[n];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
        if (!ok) return 0;
    }
    return n >= 1;
}

int srv_session_path(const char *dir, const char *id, char **path, char *msg, size_t msg_cap) {
    if (path) *path = NULL;
    if (!path || !dir || !*dir) {
        snprintf(msg, msg_cap, "sessions are not enabled");
        return -1;
    }
    if (!srv_session_id_valid(id)) {
        snprintf(msg, msg_cap, "session id: want 1 to %d characters of A-Z a-z 0-9 _ -", SRV_SESSION_ID_MAX);
        return -1;
    }
    char *rdir = realpath(dir, NULL);
    if (!rdir) {
        snprintf(msg, msg_cap, "sessions folder %.200s: %s", dir, strerror(errno));
        return -1;
    }
    struct stat st;
    if (stat(rdir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(msg, msg_cap, "sessions folder %.200s is not a folder", dir);
        free(rdir);
        return -1;
    }
    size_t n = strlen(rdir) + 1 + strlen(id) + sizeof ".tsess";
    char *p = malloc(n);
    if (!p) {
        snprintf(msg, msg_cap, "out of memory");
        free(rdir);
        return -1;
    }
    /* The root folder resolves to "/": no second slash then. */
    size_t dl = strcmp(rdir, "/") ? strlen(rdir) : 0;
    snprintf(p, n, "%.*s/%s.tsess", (int)dl, rdir, id);
    int rc = -1;
    if (lstat(p, &st) != 0) {
        if (errno == ENOENT) rc = 0; /* absent: the scheduler creates it */
        else snprintf(msg, msg_cap, "session %s: %s", id, strerror(errno));
    } else if (S_ISLNK(st.st_mode)) {
        snprintf(msg, msg_cap, "session %s: the file is a symbolic link, refused", id);
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(msg, msg_cap, "session %s: not a regular file, refused", id);
    } else if (st.st_nlink != 1) {
        snprintf(msg, msg_cap, "session %s: the file has %lu hard links, refused", id, (unsigned long)st.st_nlink);
    } else {
        /* Not a link itself; a parent path component cannot be one either
         * (rdir is resolved and the id has no '/'), but check the resolved
         * path anyway: it must be rdir + "/" + a name without '/'. */
        char *rp = realpath(p, NULL);
        if (!rp) {
            snprintf(msg, msg_cap, "session %s: %s", id, strerror(errno));
        } else if (strncmp(rp, rdir, dl) != 0 || rp[dl] != '/' || strchr(rp + dl + 1, '/')) {
            snprintf(msg, msg_cap, "session %s: the file resolves outside the sessions folder, refused", id);
        } else {
            rc = 0;
        }
        free(rp);
    }
    free(rdir);
    if (rc == 0) *path = p;
    else free(p);
    return rc;
}
