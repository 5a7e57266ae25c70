package qga

// The environment of every command the client starts in a guest is fixed
// here, on the client's side; nothing the guest prints becomes part of it.
//
// qemu-ga hands guest-exec's env list to g_spawn_async_with_pipes as the
// child's whole envp: without the list the child inherits the agent's own
// environment, with it the child gets exactly the list, not merged with
// the agent's (QEMU qga/commands.c, qmp_guest_exec: "envp = has_env ?
// guest_exec_get_args(env, false) : NULL", spawned with
// G_SPAWN_SEARCH_PATH | G_SPAWN_DO_NOT_REAP_CHILD |
// G_SPAWN_SEARCH_PATH_FROM_ENVP, so the program is looked up in the PATH
// of the list; GLib's g_spawn_async_with_pipes gives the child the
// parent's environment only for a NULL envp). So every guest-exec the client sends carries a whole
// environment: BaseEnv, plus the exec's tag on the tagged direct path;
// the wrapper adds the request's Env (and for User, HOME, USER and
// LOGNAME) on top of it.
//
// An earlier version read the agent's environment with a bare guest-exec
// of the guest's own /usr/bin/env -0 and cached it per socket path for a
// minute: the guest decided what it said, and because Proxmox reuses a
// freed VMID (and with it the socket path) for the next clone, the next
// sandbox on that VMID ran its argv-only execs with the previous tenant's
// PATH and BASH_ENV (issue 34, finding 1). There is no such capture or
// cache any more: the base is a constant.

const (
	// BasePath is the PATH of every command the client starts in a guest
	// (unless the request's Env sets another): the system directories,
	// /usr/local first, as Debian's /etc/profile gives root.
	BasePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// BaseHome is HOME for commands run as the agent's user (root). A
	// request with User gets that user's home directory from the guest's
	// passwd database instead, or / when it has none.
	BaseHome = "/root"
	// BaseLang is LANG: UTF-8 text without a locale the guest may lack
	// (C.UTF-8 is built into glibc since 2.35 and shipped by Debian).
	BaseLang = "C.UTF-8"

	// envTagName names the entry that marks every process of one tagged
	// exec; its value is a fresh random 32-hex-digit tag per exec.
	envTagName = "PVE_INSPECT_EXEC"
)

// BaseEnv returns the whole environment of a command started in a guest
// before the request's Env is added: PATH=BasePath, HOME=BaseHome and
// LANG=BaseLang, and nothing else. It returns a new slice on each call.
func BaseEnv() []string {
	return []string{"PATH=" + BasePath, "HOME=" + BaseHome, "LANG=" + BaseLang}
}

// taggedEnv is BaseEnv plus the entry envTagName=tag.
func taggedEnv(tag string) []string {
	return append(BaseEnv(), envTagName+"="+tag)
}
