// Command etcd runs a single-member etcd from the same etcd release that the pinned
// kube-apiserver links against, so the test control plane never mixes storage versions.
// It takes only the few flags the e2e harness needs.
package main

import (
	"flag"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

func mustURL(raw string) url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		log.Fatalf("bad url %q: %v", raw, err)
	}
	return *u
}

func main() {
	dataDir := flag.String("data-dir", "default.etcd", "directory for the member's data")
	client := flag.String("listen-client-urls", "http://127.0.0.1:2379", "client URL")
	peer := flag.String("listen-peer-urls", "http://127.0.0.1:2380", "peer URL")
	noFsync := flag.Bool("unsafe-no-fsync", false, "skip fsync (throwaway test data only)")
	flag.Parse()

	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.LogLevel = "warn"
	cfg.UnsafeNoFsync = *noFsync
	clientURL, peerURL := mustURL(*client), mustURL(*peer)
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()

	server, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("start etcd: %v", err)
	}
	defer server.Close()
	<-server.Server.ReadyNotify()
	log.Printf("etcd ready on %s", clientURL.String())

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-stop:
	case err := <-server.Err():
		log.Fatalf("etcd failed: %v", err)
	}
}
