// Package deploy holds the deployment files; its tests check them.
package deploy
