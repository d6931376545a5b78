package tokenize

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// hfRepoID matches a Hugging Face model id, ORG/NAME.
var hfRepoID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$`)

// HFCacheDir is the Hugging Face hub cache the way huggingface_hub finds
// it: $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
// else ~/.cache/huggingface/hub.
func HFCacheDir() string {
	if d := os.Getenv("HF_HUB_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("HF_HOME"); d != "" {
		return filepath.Join(d, "hub")
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "huggingface", "hub")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(".cache", "huggingface", "hub")
	}
	return filepath.Join(home, ".cache", "huggingface", "hub")
}

// resolveHFCache finds a model id's snapshot directory in the local
// Hugging Face cache (models--ORG--NAME/snapshots/REV, REV from refs/main,
// or the only snapshot holding a tokenizer.json). It never downloads.
func resolveHFCache(id string) (string, error) {
	cache := HFCacheDir()
	repo := filepath.Join(cache, "models--"+strings.ReplaceAll(id, "/", "--"))
	notHere := fmt.Errorf("tokenizer %q: not a file or directory, and not in the local Hugging Face cache (%s); download it there first (huggingface-cli download %s tokenizer.json tokenizer_config.json) or give the model's directory", id, repo, id)
	if _, err := os.Stat(repo); err != nil {
		return "", notHere
	}
	if ref, err := os.ReadFile(filepath.Join(repo, "refs", "main")); err == nil {
		snap := filepath.Join(repo, "snapshots", strings.TrimSpace(string(ref)))
		if _, err := os.Stat(filepath.Join(snap, "tokenizer.json")); err == nil {
			return snap, nil
		}
	}
	snaps, _ := filepath.Glob(filepath.Join(repo, "snapshots", "*", "tokenizer.json"))
	switch len(snaps) {
	case 0:
		return "", fmt.Errorf("tokenizer %q: the local Hugging Face cache has %s but no snapshot with a tokenizer.json; download it (huggingface-cli download %s tokenizer.json tokenizer_config.json)", id, repo, id)
	case 1:
		return filepath.Dir(snaps[0]), nil
	}
	var revs []string
	for _, s := range snaps {
		revs = append(revs, filepath.Base(filepath.Dir(s)))
	}
	return "", errors.New("tokenizer " + fmt.Sprintf("%q", id) + ": the local Hugging Face cache has several snapshots and no refs/main (" + strings.Join(revs, ", ") + "); give one's directory, " + filepath.Join(repo, "snapshots", revs[0]))
}

// locate stats a tokenizer spec that is not builtin:sim: a path as given,
// or else a Hugging Face model id resolved in the local cache. It returns
// the path to read and its FileInfo.
func locate(spec string) (string, os.FileInfo, error) {
	st, err := os.Stat(spec)
	if err == nil {
		return spec, st, nil
	}
	if errors.Is(err, os.ErrNotExist) && hfRepoID.MatchString(spec) {
		dir, herr := resolveHFCache(spec)
		if herr != nil {
			return "", nil, herr
		}
		st, err = os.Stat(dir)
		return dir, st, err
	}
	return "", nil, fmt.Errorf("tokenizer %q: want %s, a model directory, a tokenizer.json path or a Hugging Face model id in the local cache: %w", spec, BuiltinSim, err)
}
