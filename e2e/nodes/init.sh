#!/bin/sh
# /init of a node's initramfs (e2e/nodes, initramfs.go): it mounts what a
# Debian machine has mounted, loads the netfilter modules, runs the job's
# script with its output on a virtio serial port (a file on the host), and
# powers off. The serial port, the console, carries this script's own
# lines, each starting with "nodes-<nonce> " so that no output of the job or
# the kernel can be taken for one: "init", "ready", "exit <status>".
export PATH=/usr/sbin:/usr/bin HOME=/root TMPDIR=/tmp TERM=dumb LC_ALL=C

mount -t proc -o nosuid,nodev,noexec proc /proc
mount -t sysfs -o nosuid,nodev,noexec sysfs /sys
mount -t devtmpfs -o nosuid,mode=0755 devtmpfs /dev
mkdir -p /dev/pts /dev/shm
# What udev links on a Debian machine: nft before 1.0 reads "-f -" from
# /dev/stdin.
ln -s /proc/self/fd /dev/fd
ln -s /proc/self/fd/0 /dev/stdin
ln -s /proc/self/fd/1 /dev/stdout
ln -s /proc/self/fd/2 /dev/stderr
mount -t devpts -o nosuid,noexec,gid=5,mode=620 devpts /dev/pts
mount -t tmpfs -o nosuid,nodev tmpfs /dev/shm
# ip netns keeps its namespaces under /run/netns (reached as /var/run too).
mount -t tmpfs -o nosuid,nodev,mode=0755 tmpfs /run
mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /tmp

read -r nonce </etc/nodes/job/nonce
mark() { echo "nodes-$nonce $*"; }
mark init

# The kernel asks modprobe for what nobody loaded (nft's expressions,
# conntrack helpers, families): busybox's, with the depmod run at build time.
echo /usr/sbin/modprobe >/proc/sys/kernel/modprobe
# Each module after those it depends on (modules.go: loadOrder).
while read -r name file; do
	[ -d "/sys/module/$name" ] && continue
	err=$(insmod "$file" 2>&1) || echo "nodes: insmod $name: $err"
done </etc/nodes/modules
ip link set lo up
hostname node
mark ready

# The job's output goes to a virtio serial port that QEMU writes to a file
# (run.go). A port opens once at a time: open it here, once.
port=
for p in /sys/class/virtio-ports/*; do
	[ "$(cat "$p/name" 2>/dev/null)" = nodes.output ] && port=/dev/${p##*/}
done
if [ -z "$port" ] || ! exec 3>"$port"; then
	echo "nodes: no virtio port nodes.output"
	mark exit 255
	poweroff -f
fi
cd /root
sh /etc/nodes/job/script </dev/null >&3 2>&3
status=$?
# The host takes the output as complete only with this line at its end.
printf 'nodes-%s end\n' "$nonce" >&3
exec 3>&-
mark exit $status
poweroff -f
